//! Tests of `fresh.rs`: a new prefix built beside it and renamed into place.

use super::*;
use crate::tree::save::{write_tree, write_tree_hooked, EntrySpec};

fn tmp() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tdrs-fresh-{}", crate::sys::storage::random_suffix()));
    std::fs::create_dir(&p).unwrap();
    p
}

fn leaf(data: &[u8]) -> LeafSpec<'_> {
    LeafSpec {
        nested: None,
        dtype: "torch.uint8".into(),
        shape: vec![data.len() as u64],
        device: "cpu".into(),
        data: Some(data),
        nbytes: data.len(),
        same_file: None,
    }
}

/// A flat tree `a`, `b` and a nested `n/c`.
fn tree() -> NodeSpec {
    NodeSpec {
        class: None,
        batch: vec![],
        entries: vec![
            ("a".into(), EntrySpec::Leaf(0)),
            ("b".into(), EntrySpec::Leaf(1)),
            (
                "n".into(),
                EntrySpec::Node(NodeSpec {
                    class: None,
                    batch: vec![],
                    entries: vec![("c".into(), EntrySpec::Leaf(2))],
                }),
            ),
        ],
    }
}

fn names(p: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    out.sort();
    out
}

fn opts() -> SaveOptions {
    SaveOptions {
        existsok: true,
        ..Default::default()
    }
}

#[test]
fn a_new_prefix_arrives_whole_with_nothing_beside_it() {
    let base = tmp();
    let prefix = base.join("tree");
    let (a, b, c) = ([1u8; 3], [2u8; 5], [3u8; 7]);
    let leaves = vec![leaf(&a), leaf(&b), leaf(&c)];
    let regions = write_tree(&prefix, &tree(), &leaves, opts()).unwrap();
    assert_eq!(regions.len(), 3);
    assert_eq!(regions[1].as_ref().unwrap().to_vec(), b);
    assert_eq!(
        regions[2].as_ref().unwrap().path(),
        Some(prefix.join("n/c.memmap").as_path())
    );
    assert_eq!(names(&base), vec!["tree".to_string()]);
    assert_eq!(names(&prefix), vec!["a.memmap", "b.memmap", "meta.json", "n"]);
    assert_eq!(std::fs::read(prefix.join("n/c.memmap")).unwrap(), c);
    let (loaded, maps) = crate::tree::load::load_tree(&prefix).unwrap();
    assert_eq!(loaded.entries.len(), 3);
    assert_eq!(maps.iter().flatten().count(), 3);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_prefix_made_meanwhile_is_kept_and_saved_into() {
    let base = tmp();
    let prefix = base.join("tree");
    let (a, b, c) = ([1u8; 3], [2u8; 5], [3u8; 7]);
    let leaves = vec![leaf(&a), leaf(&b), leaf(&c)];
    // Someone creates the prefix (with a file of theirs) between the plan and the rename.
    let made = std::cell::Cell::new(None);
    let hook = || {
        std::fs::create_dir(&prefix).unwrap();
        std::fs::write(prefix.join("mine.txt"), b"mine").unwrap();
        made.set(Some(crate::sys::identity::of_path(&prefix).unwrap()));
    };
    write_tree_hooked(&prefix, &tree(), &leaves, opts(), &hook).unwrap();
    assert_eq!(
        crate::sys::identity::of_path(&prefix).unwrap(),
        made.get().unwrap(),
        "the same directory"
    );
    assert_eq!(std::fs::read(prefix.join("mine.txt")).unwrap(), b"mine");
    assert_eq!(std::fs::read(prefix.join("a.memmap")).unwrap(), a);
    assert_eq!(names(&base), vec!["tree".to_string()], "no sibling left");
    assert!(!names(&prefix).iter().any(|n| n.starts_with(".tdrs")));
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_file_made_at_the_prefix_meanwhile_is_not_replaced() {
    let base = tmp();
    let prefix = base.join("tree");
    let (a, b, c) = ([1u8; 3], [2u8; 5], [3u8; 7]);
    let leaves = vec![leaf(&a), leaf(&b), leaf(&c)];
    let hook = || std::fs::write(&prefix, b"a file").unwrap();
    assert!(write_tree_hooked(&prefix, &tree(), &leaves, opts(), &hook).is_err());
    assert_eq!(std::fs::read(&prefix).unwrap(), b"a file");
    assert_eq!(names(&base), vec!["tree".to_string()], "no sibling left");
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn existsok_false_refuses_a_tree_saved_meanwhile() {
    let base = tmp();
    let prefix = base.join("tree");
    let (a, b, c) = ([1u8; 3], [2u8; 5], [3u8; 7]);
    let leaves = vec![leaf(&a), leaf(&b), leaf(&c)];
    let other = [9u8; 3];
    let first = vec![leaf(&other), leaf(&other), leaf(&other)];
    let hook = || {
        write_tree(&prefix, &tree(), &first, opts()).unwrap();
    };
    let strict = SaveOptions {
        existsok: false,
        ..Default::default()
    };
    assert!(write_tree_hooked(&prefix, &tree(), &leaves, strict, &hook).is_err());
    assert_eq!(
        std::fs::read(prefix.join("a.memmap")).unwrap(),
        other,
        "the other save's tree stays"
    );
    assert_eq!(names(&base), vec!["tree".to_string()]);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_killed_saves_sibling_goes_but_foreign_files_in_it_stay() {
    let base = tmp();
    let prefix = base.join("tree");
    let sibling = base.join(sibling_name("tree"));
    // what a save killed before its rename leaves (no lock held: its process is gone)
    std::fs::create_dir_all(sibling.join("n")).unwrap();
    std::fs::write(sibling.join("a.memmap"), b"old").unwrap();
    std::fs::write(sibling.join("n/c.memmap"), b"old").unwrap();
    let (a, b, c) = ([1u8; 3], [2u8; 5], [3u8; 7]);
    let leaves = vec![leaf(&a), leaf(&b), leaf(&c)];
    write_tree(&prefix, &tree(), &leaves, opts()).unwrap();
    assert_eq!(names(&base), vec!["tree".to_string()]);
    assert_eq!(std::fs::read(prefix.join("n/c.memmap")).unwrap(), c);

    // a sibling holding a file no save makes keeps it (and the save still goes through)
    let other = base.join("other");
    let sibling = base.join(sibling_name("other"));
    std::fs::create_dir(&sibling).unwrap();
    std::fs::write(sibling.join("notes.txt"), b"mine").unwrap();
    std::fs::write(sibling.join("a.memmap"), b"old").unwrap();
    write_tree(&other, &tree(), &leaves, opts()).unwrap();
    assert_eq!(std::fs::read(sibling.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(std::fs::read(other.join("b.memmap")).unwrap(), b);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_live_saves_sibling_is_left_alone() {
    let base = tmp();
    let prefix = base.join("tree");
    let sibling = base.join(sibling_name("tree"));
    std::fs::create_dir(&sibling).unwrap();
    std::fs::write(sibling.join("a.memmap"), b"theirs").unwrap();
    let live = Dir::open(&sibling).unwrap();
    assert!(live.lock(true, false).unwrap());
    let (a, b, c) = ([1u8; 3], [2u8; 5], [3u8; 7]);
    let leaves = vec![leaf(&a), leaf(&b), leaf(&c)];
    // the other save holds it: this one saves into a directory of its own instead
    write_tree(&prefix, &tree(), &leaves, opts()).unwrap();
    assert_eq!(std::fs::read(sibling.join("a.memmap")).unwrap(), b"theirs");
    assert_eq!(std::fs::read(prefix.join("a.memmap")).unwrap(), a);
    drop(live);
    std::fs::remove_dir_all(&base).unwrap();
}
