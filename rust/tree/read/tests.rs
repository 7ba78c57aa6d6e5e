#[cfg(unix)]
use std::path::Path;
use std::path::PathBuf;

use serde_json::Value;

use super::*;
use crate::sys::storage::random_suffix;
#[cfg(unix)]
use crate::tree::load::{load_tree, verify_tree};
use crate::tree::save::{write_tree, EntrySpec, LeafSpec, NodeSpec, SaveOptions};

/// A saved tree with a leaf `x` in sub-directory `sub` and a non-tensor value `s`.
fn saved() -> PathBuf {
    let p = std::env::temp_dir().join(format!("tdrs-read-{}", random_suffix()));
    let data = [7u8; 8];
    let leaves = vec![LeafSpec {
        nested: None,
        dtype: "torch.float32".into(),
        shape: vec![2],
        device: "cpu".into(),
        data: Some(&data),
        nbytes: 8,
        same_file: None,
    }];
    let sub = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("x".into(), EntrySpec::Leaf(0))],
    };
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![
            ("sub".into(), EntrySpec::Node(sub)),
            ("s".into(), EntrySpec::NonTensor(Value::from("hi"))),
        ],
    };
    write_tree(&p, &root, &leaves, SaveOptions::default()).unwrap();
    p
}

#[cfg(unix)]
fn is_symlink_error(e: &Error) -> bool {
    matches!(e, Error::Symlink { .. }) && e.to_string().contains("symlink")
}

#[test]
fn a_sound_tree_reads() {
    let p = saved();
    let root = Dir::open(&p).unwrap();
    assert!(matches!(read_meta(&root).unwrap(), NodeMeta::TensorDict(_)));
    let sub = open_child_dir(&root, "sub").unwrap();
    assert!(matches!(read_meta(&sub).unwrap(), NodeMeta::TensorDict(_)));
    let missing = open_child_dir(&root, "nope").unwrap_err();
    assert!(matches!(missing, Error::Invalid { .. }), "{missing}");
    let leaf = open_child_dir(&sub, "x.memmap").unwrap_err();
    assert!(
        matches!(leaf, Error::Invalid { .. }),
        "a file is no directory: {leaf}"
    );
    std::fs::remove_dir_all(&p).unwrap();
}

/// A symlink in place of a sub-directory is refused as a symlink, by the opener and by every
/// reader built on it (the loader, the verifier), whether it leads to a sound directory or not.
#[cfg(unix)]
#[test]
fn a_symlinked_sub_directory_is_refused_as_a_symlink() {
    let p = saved();
    let elsewhere = saved();
    std::fs::remove_dir_all(p.join("sub")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("sub"), p.join("sub")).unwrap();
    let root = Dir::open(&p).unwrap();
    let err = open_child_dir(&root, "sub").unwrap_err();
    assert!(is_symlink_error(&err), "{err}");
    let err = load_tree(&p).unwrap_err();
    assert!(is_symlink_error(&err), "{err}");
    let problems = verify_tree(&p);
    assert!(
        problems.len() == 1 && problems[0].contains("symlink"),
        "{problems:?}"
    );
    for dir in [&p, &elsewhere] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A symlink in place of a meta.json is refused as a symlink, at the root and below it.
#[cfg(unix)]
#[test]
fn a_symlinked_meta_json_is_refused_as_a_symlink() {
    let p = saved();
    let copy = p.with_extension("meta");
    for at in [p.clone(), p.join("sub")] {
        let meta: &Path = &at.join("meta.json");
        std::fs::rename(meta, &copy).unwrap();
        std::os::unix::fs::symlink(&copy, meta).unwrap();
        let err = read_meta(&Dir::open(&at).unwrap()).unwrap_err();
        assert!(is_symlink_error(&err), "{err}");
        let err = load_tree(&p).unwrap_err();
        assert!(is_symlink_error(&err), "{err}");
        std::fs::remove_file(meta).unwrap();
        std::fs::rename(&copy, meta).unwrap();
    }
    load_tree(&p).unwrap();
    std::fs::remove_dir_all(&p).unwrap();
}
