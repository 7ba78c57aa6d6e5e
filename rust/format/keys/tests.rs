use super::*;
use crate::format::meta::LEAF_SUFFIX;

#[test]
fn encodes_like_the_reference() {
    assert_eq!(encode_key("odd/key with space"), "odd%2Fkey%20with%20space");
    assert_eq!(encode_key("a%2Fb"), "a%252Fb");
    assert_eq!(encode_key("x\ty"), "x%09y");
    assert_eq!(encode_key("é ü*?"), "é%20ü%2A%3F");
    assert_eq!(encode_key("a.b"), "a.b");
    assert_eq!(encode_key(""), "%");
    assert_eq!(encode_key("."), "%2E");
    assert_eq!(encode_key(".."), "%2E%2E");
    assert_eq!(encode_key("../x"), "..%2Fx");
    assert_eq!(leaf_file("a"), "a.memmap");
}

#[test]
fn encoded_names_are_one_component() {
    for key in ["../../etc", "/abs", "a\\b", "..", ".", "", "\0", "c:x"] {
        let name = encode_key(key);
        assert!(
            !name.contains('/') && !name.contains('\\') && name != "." && name != "..",
            "{key:?}"
        );
    }
}

/// `%XX` decoding, as tensordict's `_decode_key_from_filesystem` does it.
fn decode(name: &str) -> String {
    if name == "%" {
        return String::new();
    }
    let mut out = Vec::new();
    let b = name.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match (b[i], name.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16))) {
            (b'%', Some(Ok(c))) => {
                out.push(c);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn windows_names_keep_devices_and_trailing_dots_out() {
    for (name, safe) in [
        ("CON", "%43ON"),
        ("nul", "%6Eul"),
        ("Com1.txt", "%43om1.txt"),
        ("LPT\u{b2}", "%4CPT\u{b2}"),
        ("aux.tar.gz", "%61ux.tar.gz"),
        ("x.", "x%2E"),
        ("NUL.", "%4EUL%2E"),
        ("COM10", "COM10"),
        ("CONSOLE", "CONSOLE"),
        ("a%3Ab", "a%3Ab"),
        ("%2E%2E", "%2E%2E"),
    ] {
        assert_eq!(windows_safe_name(name.to_string()), safe, "{name:?}");
    }
    for key in [
        "CON", "nul", "a:b", "x.", "y ", "z. .", "COM1", "lpt9.txt", "..", "",
    ] {
        let reference = portable_key(key);
        let windows = windows_safe_name(reference.clone());
        assert_eq!(decode(&reference), key);
        assert_eq!(decode(&windows), key, "{windows:?}");
        assert!(
            !windows.ends_with(['.', ' ']) && !windows.contains(':'),
            "{windows:?}"
        );
        let leaf = format!("{reference}{LEAF_SUFFIX}");
        let windows_leaf = windows_safe_name(leaf.clone());
        if !key.is_empty() {
            assert_eq!(decode(&windows_leaf), format!("{key}{LEAF_SUFFIX}"));
        }
        let (expected, expected_leaf) = if cfg!(windows) {
            (windows, windows_leaf)
        } else {
            (reference, leaf)
        };
        assert_eq!(encode_key(key), expected);
        assert_eq!(leaf_file(key), expected_leaf);
        assert_eq!(
            portable_leaf_file(key),
            format!("{}{LEAF_SUFFIX}", portable_key(key))
        );
    }
    // A leaf's name is escaped whole: a trailing dot of the key is no trailing dot there.
    assert_eq!(windows_safe_name("x..memmap".into()), "x..memmap");
    assert_eq!(windows_safe_name("CON.memmap".into()), "%43ON.memmap");
    // Windows never opens a raw (legacy) device name or data stream.
    assert_eq!(legacy_name("CON").is_none(), cfg!(windows));
    assert_eq!(legacy_name("ab:c").is_none(), cfg!(windows));
    assert_eq!(legacy_name("CONSOLE"), Some("CONSOLE"));
}

#[test]
fn legacy_names_are_checked() {
    assert_eq!(legacy_name("abc"), Some("abc"));
    assert_eq!(legacy_name("a/b"), None);
    assert_eq!(legacy_name(".."), None);
    assert_eq!(legacy_name("c:x"), None);
}
