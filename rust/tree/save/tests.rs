use serde_json::Value;

use super::*;
use crate::format::stack::meta_bytes;
use crate::sys::storage::random_suffix;
use crate::tree::load::{load_tree, LoadedEntry};

fn tree(strings: &[&str], note: &str) -> NodeSpec {
    let data = serde_json::to_vec(strings).unwrap();
    NodeSpec {
        class: None,
        batch: vec![strings.len() as u64],
        entries: vec![
            ("s".into(), EntrySpec::Stack(meta_bytes(0, None, &data, None))),
            ("note".into(), EntrySpec::NonTensor(Value::from(note))),
        ],
    }
}

fn save(p: &Path, strings: &[&str], note: &str) {
    let opts = SaveOptions {
        existsok: true,
        ..Default::default()
    };
    write_tree(p, &tree(strings, note), &[], opts).unwrap();
}

/// The tokens of the value entries of the tree at `p`, as a load reads them.
fn loaded_tokens(p: &Path) -> (u64, u64) {
    let (node, _) = load_tree(p).unwrap();
    let (mut stack, mut note) = (None, None);
    for (key, entry) in node.entries {
        match entry {
            LoadedEntry::Stack(_, token) if key == "s" => stack = token,
            LoadedEntry::NonTensor(_, token) if key == "note" => note = token,
            _ => {}
        }
    }
    (stack.unwrap(), note.unwrap())
}

fn stack_meta(strings: &[&str]) -> Vec<u8> {
    meta_bytes(0, None, &serde_json::to_vec(strings).unwrap(), None)
}

fn note_meta(note: &str) -> Vec<u8> {
    format::non_tensor_meta(&Value::from(note))
}

/// A tree loaded before the directory was saved again writes a value in place: the newer
/// save's meta.json is not the one it loaded, so the rewrite is refused, naming the file, and
/// the newer values are kept (also where the newer save has more rows).
#[test]
fn a_rewrite_from_a_stale_tree_is_refused() {
    let p = std::env::temp_dir().join(format!("tdrs-rewrite-{}", random_suffix()));
    save(&p, &["old0", "old1", "old2"], "old");
    let (stack, note) = loaded_tokens(&p);
    assert_eq!(value_meta_token(&p, "s").unwrap(), stack);
    assert_eq!(value_meta_token(&p, "note").unwrap(), note);
    save(&p, &["new0", "new1", "new2", "new3"], "new"); // a newer save
    let newer = std::fs::read(p.join("s").join(format::META_FILE)).unwrap();
    let err =
        rewrite_value_dir(&p, "s", &stack_meta(&["old0", "R", "old2"]), false, Some(stack)).unwrap_err();
    assert!(matches!(err, Error::Tree { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("saved again") && text.contains("meta.json"),
        "{text}"
    );
    let err = rewrite_value_meta(&p, "note", &note_meta("reader"), false, true, Some(note)).unwrap_err();
    assert!(err.to_string().contains("saved again"), "{err}");
    assert_eq!(std::fs::read(p.join("s").join(format::META_FILE)).unwrap(), newer);
    let (node, _) = load_tree(&p).unwrap();
    assert!(matches!(&node.entries[1].1, LoadedEntry::NonTensor(Value::String(s), _) if s == "new"));
    // with the token of the file in place, the write goes through and gives the next token
    let (stack, note) = loaded_tokens(&p);
    let written = stack_meta(&["new0", "R", "new2", "new3"]);
    let next = rewrite_value_dir(&p, "s", &written, false, Some(stack)).unwrap();
    assert_eq!(next, format::meta::meta_token(&written));
    assert_eq!(value_meta_token(&p, "s").unwrap(), next);
    let next = rewrite_value_dir(&p, "s", &stack_meta(&["a", "b", "c", "d"]), false, Some(next)).unwrap();
    assert_eq!(loaded_tokens(&p).0, next);
    rewrite_value_meta(&p, "note", &note_meta("mine"), false, true, Some(note)).unwrap();
    // without a token: not checked (the former behaviour)
    rewrite_value_dir(&p, "s", &stack_meta(&["w", "x", "y", "z"]), false, None).unwrap();
    std::fs::remove_dir_all(&p).unwrap();
}

/// tensordict saves again by writing meta.json in place (same inode), here with values of the
/// same length, within the same clock tick: the bytes tell, not the file's identity or time.
#[test]
fn an_in_place_rewrite_of_the_same_size_is_seen() {
    let p = std::env::temp_dir().join(format!("tdrs-rewrite-inplace-{}", random_suffix()));
    save(&p, &["old0", "old1"], "old");
    let (stack, _) = loaded_tokens(&p);
    let at = p.join("s").join(format::META_FILE);
    let before = std::fs::metadata(&at).unwrap();
    let newer = stack_meta(&["new0", "new1"]);
    std::fs::write(&at, &newer).unwrap(); // truncate and write: the same file
    let after = std::fs::metadata(&at).unwrap();
    assert_eq!(
        crate::sys::identity::of_metadata(&before),
        crate::sys::identity::of_metadata(&after)
    );
    assert_eq!(before.len(), after.len());
    let err = rewrite_value_dir(&p, "s", &stack_meta(&["old0", "R"]), false, Some(stack)).unwrap_err();
    assert!(err.to_string().contains("saved again"), "{err}");
    assert_eq!(std::fs::read(&at).unwrap(), newer);
    std::fs::remove_dir_all(&p).unwrap();
}
