use super::*;
use crate::sys::storage;
use crate::tree::save::{write_tree, EntrySpec, LeafSpec, NodeSpec, SaveOptions};

fn saved() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tdrs-load-{}", storage::random_suffix()));
    let data: Vec<u8> = (0..24).collect();
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
        entries: vec![("sub".into(), EntrySpec::Node(child))],
    };
    write_tree(
        &p,
        &root,
        &leaves,
        SaveOptions {
            existsok: true,
            ..Default::default()
        },
    )
    .unwrap();
    p
}

fn load_err(p: &Path) -> String {
    load_tree(p).unwrap_err().to_string()
}

#[test]
fn loads_a_saved_tree() {
    let p = saved();
    let (node, regions) = load_tree(&p).unwrap();
    let LoadedEntry::Node(sub) = &node.entries[0].1 else {
        panic!()
    };
    let LoadedEntry::Leaf {
        dtype, shape, index, ..
    } = &sub.entries[0].1
    else {
        panic!()
    };
    assert_eq!((*dtype, shape.as_slice()), ("torch.float32", &[3u64, 2][..]));
    assert_eq!(
        regions[*index].as_ref().unwrap().to_vec(),
        (0..24).collect::<Vec<u8>>()
    );
    assert!(verify_tree(&p).is_empty());
    drop(regions); // Windows refuses to delete a mapped file.
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn refuses_truncated_missing_and_symlinked_files() {
    let p = saved();
    let file = p.join("sub/x.memmap");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(10)
        .unwrap();
    assert!(load_err(&p).contains("truncated"));
    assert_eq!(verify_tree(&p).len(), 1);
    std::fs::remove_file(&file).unwrap();
    assert!(load_err(&p).contains("missing"));
    #[cfg(unix)]
    {
        let outside = p.with_extension("outside");
        std::fs::write(&outside, [0u8; 24]).unwrap();
        std::os::unix::fs::symlink(&outside, &file).unwrap();
        assert!(load_err(&p).contains("symlink"));
        std::fs::remove_file(&outside).unwrap();
    }
    std::fs::remove_dir_all(p.join("sub")).unwrap();
    assert!(load_err(&p).contains("sub-directory"));
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn longer_files_load() {
    let p = saved();
    let file = p.join("sub/x.memmap");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(100)
        .unwrap();
    assert!(load_tree(&p).is_ok());
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn a_tensorclass_node_is_saved_in_tensordicts_layout_and_loads_with_its_class() {
    use crate::tree::save::ClassSpec;
    let p = std::env::temp_dir().join(format!("tdrs-load-tc-{}", storage::random_suffix()));
    let data: Vec<u8> = (0..12).collect();
    let leaves = vec![LeafSpec {
        dtype: "torch.uint8".into(),
        shape: vec![3, 4],
        device: "cpu".into(),
        data: Some(&data),
        nbytes: 12,
        same_file: None,
        nested: None,
    }];
    let class = |name: &str| ClassSpec {
        name: name.into(),
        meta: format!(r#"{{"_type": "<class '__main__.{name}'>"}}"#).into_bytes(),
    };
    let inner = NodeSpec {
        class: Some(class("Inner")),
        batch: vec![3],
        entries: vec![("y".into(), EntrySpec::Leaf(0))],
    };
    let root = NodeSpec {
        class: Some(class("Outer")),
        batch: vec![3],
        entries: vec![("inner".into(), EntrySpec::Node(inner))],
    };
    write_tree(&p, &root, &leaves, SaveOptions::default()).unwrap();
    let read = |rel: &str| std::fs::read_to_string(p.join(rel)).unwrap();
    assert_eq!(read("meta.json"), r#"{"_type": "<class '__main__.Outer'>"}"#);
    assert!(read("_tensordict/meta.json").starts_with(r#"{"inner": {"type": "Inner"}"#));
    assert_eq!(
        read("_tensordict/inner/meta.json"),
        r#"{"_type": "<class '__main__.Inner'>"}"#
    );
    assert!(p.join("_tensordict/inner/_tensordict/y.memmap").is_file());
    let (node, regions) = load_tree(&p).unwrap();
    assert!(node.class.as_deref().unwrap().contains("__main__.Outer"));
    let LoadedEntry::Node(sub) = &node.entries[0].1 else {
        panic!()
    };
    assert!(sub.class.as_deref().unwrap().contains("__main__.Inner"));
    let LoadedEntry::Leaf { index, .. } = &sub.entries[0].1 else {
        panic!()
    };
    assert_eq!(regions[*index].as_ref().unwrap().to_vec(), data);
    assert!(verify_tree(&p).is_empty());
    // a pickled field is refused, never read
    std::fs::write(p.join("other.pickle"), b"x").unwrap();
    assert!(load_err(&p).contains("pickle"));
    drop(regions);
    std::fs::remove_dir_all(&p).unwrap();
}

/// A NonTensorData whose meta.json is past `META_LIMIT` (its value lives in it, as a stack's
/// do) loads and verifies, and the directory can be saved over again: what a save writes
/// reads back. Something else that large is still refused.
#[test]
fn a_non_tensor_value_past_meta_limit_loads() {
    let p = std::env::temp_dir().join(format!("tdrs-load-big-{}", storage::random_suffix()));
    let big = "x".repeat(format::META_LIMIT as usize + 1000);
    let root = NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![("big".into(), EntrySpec::NonTensor(Value::from(big.clone())))],
    };
    let opts = SaveOptions {
        existsok: true,
        ..Default::default()
    };
    write_tree(&p, &root, &[], opts).unwrap();
    let (node, _) = load_tree(&p).unwrap();
    let LoadedEntry::NonTensor(Value::String(loaded), Some(_)) = &node.entries[0].1 else {
        panic!("{:?}", node.entries[0].0)
    };
    assert_eq!(loaded.len(), big.len());
    assert!(verify_tree(&p).is_empty(), "{:?}", verify_tree(&p));
    write_tree(&p, &root, &[], opts).unwrap(); // saved over: the old value directory is ours
                                               // a TensorDict's meta.json that large is garbage, refused as before
    let sub = p.join("big").join(format::META_FILE);
    let mut text = std::fs::read(&sub).unwrap();
    text.splice(
        0..0,
        b"{\"_type\":\"<class 'tensordict._td.TensorDict'>\",\"pad\":"
            .iter()
            .copied(),
    );
    std::fs::write(&sub, &text).unwrap();
    assert!(load_err(&p).contains("more than the limit"), "{}", load_err(&p));
    std::fs::remove_dir_all(&p).unwrap();
}
