//! Tests of `layout.rs` (kept beside it so that the module itself stays readable).

use super::*;

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

#[test]
fn writes_the_reference_format() {
    let meta = tensordict_meta(
        [
            (
                "f32",
                EntryMeta::Leaf {
                    dtype: "torch.float32",
                    shape: &[3, 2],
                    device: "cpu",
                },
            ),
            ("nested", EntryMeta::TensorDict),
        ],
        &[3],
    );
    assert_eq!(
        String::from_utf8(meta).unwrap(),
        r#"{"f32": {"device": "cpu", "shape": [3, 2], "dtype": "torch.float32", "is_nested": false}, "nested": {"type": "TensorDict"}, "shape": [3], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>", "_format_version": 1, "_class": "tensordict:TensorDict"}"#
    );
    assert_eq!(
        String::from_utf8(non_tensor_meta(&Value::from("hello"))).unwrap(),
        r#"{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": "hello", "_metadata": null, "_is_non_tensor": true}"#
    );
}

#[test]
fn parses_what_it_writes() {
    let meta = tensordict_meta(
        [(
            "x",
            EntryMeta::Leaf {
                dtype: "torch.int64",
                shape: &[4, 5],
                device: "cuda:0",
            },
        )],
        &[4],
    );
    let NodeMeta::TensorDict(td) = parse_meta(&meta, Path::new("p")).unwrap() else {
        panic!()
    };
    assert_eq!(td.batch, vec![4]);
    assert_eq!(td.device.as_deref(), Some("cpu"));
    let (key, Entry::Leaf(leaf)) = &td.entries[0] else {
        panic!()
    };
    assert_eq!((key.as_str(), leaf.nbytes, leaf.dtype.itemsize), ("x", 160, 8));
}

fn parse_err(json: &str) -> String {
    parse_meta(json.as_bytes(), Path::new("/d/meta.json"))
        .unwrap_err()
        .to_string()
}

#[test]
fn refuses_bad_meta() {
    let td = r#""_type": "<class 'tensordict._td.TensorDict'>""#;
    assert!(parse_err("{not json").contains("not valid JSON"));
    assert!(parse_err("").contains("not valid JSON"));
    assert!(parse_err("[1]").contains("not a JSON object"));
    assert!(parse_err("{}").contains("no _type"));
    assert!(parse_err(&format!(r#"{{{td}, "_format_version": 7}}"#)).contains("_format_version 7"));
    let leaf = |entry: &str| parse_err(&format!(r#"{{{td}, "shape": [2], "x": {entry}}}"#));
    assert!(leaf(r#"{"dtype": "torch.foo", "shape": [2]}"#).contains("unknown dtype"));
    assert!(leaf(r#"{"shape": [2]}"#).contains("dtype is missing"));
    assert!(leaf(r#"{"dtype": "torch.float32", "shape": [2, -1]}"#).contains("non-negative"));
    assert!(leaf(r#"{"dtype": "torch.float32", "shape": [2, 1.5]}"#).contains("non-negative"));
    assert!(
        leaf(r#"{"dtype": "torch.float32", "shape": [2, 4294967296, 4294967296]}"#).contains("overflows")
    );
    assert!(leaf(r#"{"dtype": "torch.float32", "shape": [3]}"#).contains("batch size"));
    assert!(leaf(r#"{"dtype": "torch.float32"}"#).contains("shape is missing"));
    assert!(leaf("7").contains("not an object"));
    assert!(leaf(r#"{"dtype": "torch.float32", "shape": [2], "is_nested": true}"#).contains("nested"));
    let pickled = r#"{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "_is_non_tensor": true}"#;
    assert!(parse_err(pickled).contains("pickle"));
}

#[test]
fn nbytes_checks_overflow() {
    assert_eq!(nbytes(&[], 4), Some(4));
    assert_eq!(nbytes(&[0, 5], 4), Some(0));
    assert_eq!(nbytes(&[u64::MAX, 2], 1), None);
    assert_eq!(nbytes(&[1 << 62], 4), None);
}

#[test]
fn streamed_meta_matches_the_value_tree() {
    // tensordict_meta streams its object; the bytes are what the Value tree gives
    let keys = ["plain", "quo\"te\\back", "ünïcode ✓", "tab\there", ""];
    let mut entries = Vec::new();
    let mut map = Map::new();
    for (i, key) in keys.iter().enumerate() {
        let (entry, value) = match i % 3 {
            0 => (
                EntryMeta::Leaf {
                    dtype: "torch.bfloat16",
                    shape: &[0, 7, u64::MAX],
                    device: "cuda:1",
                },
                serde_json::json!({"device": "cuda:1", "shape": [0u64, 7u64, u64::MAX], "dtype": "torch.bfloat16", "is_nested": false}),
            ),
            1 => (EntryMeta::TensorDict, serde_json::json!({"type": "TensorDict"})),
            _ => (
                EntryMeta::NonTensorData,
                serde_json::json!({"type": "NonTensorData"}),
            ),
        };
        entries.push((*key, entry));
        map.insert(key.to_string(), value);
    }
    map.insert("shape".into(), Value::from(Vec::<u64>::new()));
    map.insert("device".into(), "cpu".into());
    map.insert("_type".into(), TD_TYPE.into());
    map.insert("_format_version".into(), FORMAT_VERSION.into());
    map.insert("_class".into(), TD_CLASS.into());
    assert_eq!(tensordict_meta(entries, &[]), to_json_bytes(&Value::Object(map)));
}
