//! Tests of packed.rs: the one-message description, its parser and the layout.

use super::*;

#[test]
fn description_round_trip() {
    let node = DescribedNode {
        batch: vec![2],
        device: Some("cpu"),
        entries: vec![
            Described::Leaf {
                key: "a",
                dtype: "torch.float32",
                shape: &[2, 3],
                device: "cpu",
            },
            Described::Node {
                key: "n\"é",
                node: DescribedNode {
                    batch: vec![2],
                    device: None,
                    entries: vec![Described::Leaf {
                        key: "x",
                        dtype: "torch.uint8",
                        shape: &[2],
                        device: "cpu",
                    }],
                },
            },
            Described::Value {
                key: "s",
                data: Value::String("hi".into()),
            },
        ],
    };
    let text = describe(&node);
    let value: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(value["a"]["shape"], serde_json::json!([2, 3]));
    let (parsed, total) = parse(&text).unwrap();
    assert_eq!(total, 64 + 2, "a: 24 bytes at 0, x: 2 bytes at 64");
    let Parsed::Leaf(key, leaf) = &parsed.entries[0] else {
        panic!()
    };
    assert_eq!((key.as_ref(), leaf.offset, leaf.nbytes), ("a", 0, 24));
    let Parsed::Node(_, inner) = &parsed.entries[1] else {
        panic!()
    };
    let Parsed::Leaf(_, x) = &inner.entries[0] else {
        panic!()
    };
    assert_eq!(x.offset, 64);
    assert_eq!(parsed.entries[2], Parsed::Value("s".into(), "\"hi\"".into()));
}

#[test]
fn refuses_bad_descriptions() {
    let ok = describe(&DescribedNode {
        batch: vec![4],
        device: None,
        entries: vec![Described::Leaf {
            key: "a",
            dtype: "torch.int64",
            shape: &[4],
            device: "cpu",
        }],
    });
    let text = String::from_utf8(ok).unwrap();
    for (broken, why) in [
        (text.replace("torch.int64", "torch.int65"), "unknown dtype"),
        (text.replace("[4], \"dtype", "[3], \"dtype"), "batch size"),
        (text.replace("[4], \"dtype", "[-1], \"dtype"), "non-negative"),
        (text[..text.len() - 2].to_string(), "not valid JSON"),
        (text.replace("_td.TensorDict", "_td.Other"), "not a TensorDict"),
    ] {
        let err = parse(broken.as_bytes()).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
    let huge = text.replace("[4], \"dtype", "[4, 4611686018427387904, 4], \"dtype");
    assert!(parse(huge.as_bytes()).unwrap_err().contains("overflows"));
}

#[test]
fn fields_named_like_the_format_are_keys_when_they_hold_objects() {
    let leaf = r#"{"device": "cpu", "shape": [2], "dtype": "torch.uint8", "is_nested": false}"#;
    let td = |inner: &str| {
        format!(
            r#"{{{inner}"shape": [2], "device": null, "_type": "{TD_TYPE}", "_format_version": 1, "_class": "{TD_CLASS}"}}"#
        )
    };
    let node = td(&format!(r#""is_nested": {leaf}, "data": {leaf}, "#));
    let text = td(&format!(r#""dtype": {node}, "z": {leaf}, "#));
    let (parsed, total) = parse(text.as_bytes()).unwrap();
    assert_eq!(ALIGN, 64);
    assert_eq!(total, 128 + 2, "dtype.data at 0, dtype.is_nested at 64, z at 128");
    let Parsed::Node(key, inner) = &parsed.entries[0] else {
        panic!("{parsed:?}")
    };
    assert_eq!(key, "dtype");
    let keys: Vec<&str> = inner
        .entries
        .iter()
        .map(|e| match e {
            Parsed::Leaf(k, _) | Parsed::Node(k, _) | Parsed::Value(k, _) | Parsed::Stack(k, _) => k.as_ref(),
        })
        .collect();
    assert_eq!(keys, ["data", "is_nested"]);
    for (broken, why) in [
        (td(r#""x": 5, "#), "entry is not an object"),
        (td(r#""x": 1.5e300, "#), "entry is not an object"),
        (td(r#""x": [1, "a"], "#), "entry is not an object"),
        (
            td(&format!(r#""a": {leaf}, "a": {leaf}, "#)),
            "a key appears twice",
        ),
        (
            td(&format!(r#""n": {}, "#, leaf.replace("false", "true"))),
            "nested tensors",
        ),
        (
            td(&format!(r#""v": {{"_type": "{NTD_TYPE}"}}, "#)),
            "without data",
        ),
    ] {
        let err = parse(broken.as_bytes()).unwrap_err();
        assert!(err.contains(why), "{broken}: {err}");
    }
}

#[test]
fn copies_of_a_range() {
    let table = [1000, 0, 10, 2000, 16, 20, 3000, 48, 4];
    let layout = PackedLayout::new(&table, 52).unwrap();
    let c = layout.copies(0, 5, 20, true);
    let zeros = ZEROS.as_ptr() as usize;
    assert_eq!(
        c,
        vec![
            Copy {
                src: 1005,
                dst: 5,
                len: 5
            },
            Copy {
                src: zeros,
                dst: 10,
                len: 6
            },
            Copy {
                src: 2000,
                dst: 16,
                len: 4
            }
        ]
    );
    // the padding between the leaves, and after the last one, is zeroed when packing only
    let all = layout.copies(100, 0, 52, true);
    let padding: Vec<(usize, usize)> = all
        .iter()
        .filter(|c| c.src == zeros)
        .map(|c| (c.dst, c.len))
        .collect();
    assert_eq!(padding, vec![(110, 6), (136, 12)]);
    assert_eq!(layout.copies(0, 0, 52, false).len(), 3);
    assert!(layout.touches_leaves(1009, 1) && !layout.touches_leaves(1010, 990));
    assert!(PackedLayout::new(&[0, 40, 20], 52).is_err());
    assert!(PackedLayout::new(&[0, 0, 20, 100, 10, 5], 52).is_err());
    assert!(PackedLayout::new(&[0, 0, 20, 10, 32, 5], 52)
        .unwrap()
        .leaves_shared());
}

#[test]
fn an_arena_of_small_parts_is_the_packed_layout() {
    // memmap_() without a prefix hands its small leaves to the arena in packed order: the
    // arena's offsets must then be the packed offsets, so that the arena is the message
    let sizes = [1usize, 0, 64, 65, 3, 4096 * 3 + 1, 7, 0, 1 << 19];
    let parts: Vec<(Option<&[u8]>, usize)> = sizes.iter().map(|&n| (None, n)).collect();
    let (offsets, total) = crate::sys::anon::arena_layout(&parts).unwrap();
    let mut end = 0;
    for (&n, &off) in sizes.iter().zip(&offsets) {
        let packed = aligned(end).unwrap();
        assert_eq!(off, packed, "a part of {n} bytes");
        end = packed + n;
    }
    assert_eq!(total, end);
}

#[test]
fn keys_named_like_non_tensor_fields_are_entries_of_a_node() {
    let leaf = |key| Described::Leaf {
        key,
        dtype: "torch.uint8",
        shape: &[3],
        device: "cpu",
    };
    let text = describe(&DescribedNode {
        batch: vec![],
        device: None,
        entries: vec![
            leaf("_is_non_tensor"),
            leaf("_metadata"),
            Described::Value {
                key: "v",
                data: Value::Bool(true),
            },
        ],
    });
    let (parsed, total) = parse(&text).unwrap();
    assert_eq!(total, 64 + 3, "both leaves kept");
    let keys: Vec<&str> = parsed
        .entries
        .iter()
        .map(|e| match e {
            Parsed::Leaf(k, _) | Parsed::Node(k, _) | Parsed::Value(k, _) | Parsed::Stack(k, _) => k.as_ref(),
        })
        .collect();
    assert_eq!(keys, ["_is_non_tensor", "_metadata", "v"]);
    assert_eq!(parsed.entries[2], Parsed::Value("v".into(), "true".into()));
}

#[test]
fn descriptions_parse_up_to_json_depth_levels() {
    // The root object is level 1, the value's object level 2, its lists from level 3 on.
    let nested = |lists: usize| (0..lists).fold(Value::from(1), |v, _| Value::Array(vec![v]));
    let text = |lists: usize| {
        describe(&DescribedNode {
            batch: vec![],
            device: None,
            entries: vec![Described::Value {
                key: "v",
                data: nested(lists),
            }],
        })
    };
    let deepest = text(JSON_DEPTH - 2);
    let (node, _) = parse(&deepest).unwrap();
    assert!(matches!(&node.entries[0], Parsed::Value(key, _) if key == "v"));
    let too_deep = text(JSON_DEPTH - 1);
    assert!(parse(&too_deep).unwrap_err().contains("recursion limit"));
}
