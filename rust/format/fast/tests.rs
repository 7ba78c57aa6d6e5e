use std::path::Path;

use super::parse;
use crate::format::{
    non_tensor_meta, parse_meta, parse_meta_generic, tensordict_meta, Entry, EntryMeta, NodeMeta, DTYPES,
};

const TD: &str = r#""_type": "<class 'tensordict._td.TensorDict'>", "_format_version": 1, "_class": "tensordict:TensorDict""#;

fn path() -> &'static Path {
    Path::new("/d/meta.json")
}

/// The fast path and the generic parser agree: whatever the fast path accepts, the generic
/// parser accepts too, with the same result; `parse_meta` gives the generic parser's answer.
fn agree(bytes: &[u8]) -> Option<NodeMeta> {
    let fast = parse(bytes);
    let generic = parse_meta_generic(bytes, path());
    let full = parse_meta(bytes, path());
    if let Some(fast) = &fast {
        let generic = generic.as_ref().unwrap_or_else(|e| {
            panic!("fast path accepted what the generic parser refuses ({e}): {bytes:?}")
        });
        assert_eq!(format!("{fast:?}"), format!("{generic:?}"), "{bytes:?}");
    }
    match (&generic, &full) {
        (Ok(g), Ok(f)) => assert_eq!(format!("{g:?}"), format!("{f:?}")),
        (Err(g), Err(f)) => assert_eq!(g.to_string(), f.to_string()),
        _ => panic!("parse_meta and the generic parser disagree on {bytes:?}"),
    }
    fast
}

fn tensordict(json: &str) -> crate::format::TensorDictMeta {
    match agree(json.as_bytes()) {
        Some(NodeMeta::TensorDict(td)) => td,
        other => panic!("not on the fast path as a TensorDict: {other:?} for {json}"),
    }
}

fn leaf(dtype: &str, shape: &str) -> String {
    format!(r#"{{"device": "cpu", "shape": {shape}, "dtype": "{dtype}", "is_nested": false}}"#)
}

#[test]
fn reads_what_the_reference_writes() {
    // As tensordict 0.15.3 writes them (json.dumps of a dict, in insertion order).
    let root = format!(
        r#"{{"a": {}, "b": {{"type": "TensorDict"}}, "s": {{"type": "NonTensorData"}}, "shape": [3], "device": "cpu", {TD}}}"#,
        leaf("torch.float32", "[3, 2]")
    );
    let td = tensordict(&root);
    assert_eq!(
        (td.batch.as_slice(), td.device.as_deref()),
        (&[3u64][..], Some("cpu"))
    );
    assert_eq!(td.format_version, Some(1));
    let keys: Vec<&str> = td.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b", "s"]);
    let Entry::Leaf(a) = &td.entries[0].1 else {
        panic!()
    };
    assert_eq!(
        (a.dtype.name, a.shape.as_slice(), a.nbytes),
        ("torch.float32", &[3u64, 2][..], 24)
    );
    assert!(matches!(td.entries[1].1, Entry::Collection));
    let nt = r#"{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": {"z": 1, "a": [1.5, 100000000000000000000000000001]}, "_metadata": null, "_is_non_tensor": true}"#;
    let Some(NodeMeta::NonTensor(data)) = agree(nt.as_bytes()) else {
        panic!()
    };
    // Key order and arbitrary-precision numbers are kept, as the generic parser keeps them.
    assert_eq!(
        data.to_string(),
        r#"{"z":1,"a":[1.5,100000000000000000000000000001]}"#
    );
}

#[test]
fn keeps_the_order_of_the_file() {
    // Not sorted, and keys that the generic per-entry code checks (`data`, `_x`) stay in place.
    let names = [
        "zeta",
        "data",
        "alpha",
        "_meta",
        "m",
        "\u{e9}t\u{e9}",
        "with \"escapes\"\n",
    ];
    let body: Vec<String> = names
        .iter()
        .map(|k| {
            format!(
                "{}: {}",
                serde_json::to_string(k).unwrap(),
                leaf("torch.uint8", "[2]")
            )
        })
        .collect();
    let td = tensordict(&format!(r#"{{{}, "shape": [2], {TD}}}"#, body.join(", ")));
    let keys: Vec<&str> = td.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, names);
    // Reserved keys may come first; metadata that is not an object is skipped.
    let td = tensordict(&format!(
        r#"{{{TD}, "shape": [], "_names": null, "_later": [1, 2], "b": {}, "a": {{"type": "TensorDict"}}}}"#,
        leaf("torch.bool", "[]")
    ));
    let keys: Vec<&str> = td.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["b", "a"]);
}

#[test]
fn reads_every_dtype() {
    for dt in DTYPES {
        let td = tensordict(&format!(
            r#"{{"x": {}, "shape": [4], {TD}}}"#,
            leaf(dt.name, "[4, 3]")
        ));
        let Entry::Leaf(x) = &td.entries[0].1 else {
            panic!()
        };
        assert_eq!(x.dtype, dt);
        assert_eq!(x.nbytes, 12 * dt.itemsize);
    }
}

#[test]
fn reads_what_this_library_writes() {
    let shapes: Vec<[u64; 2]> = DTYPES.iter().enumerate().map(|(i, _)| [5, i as u64]).collect();
    let keys: Vec<String> = (0..DTYPES.len())
        .map(|i| format!("k{}", DTYPES.len() - i))
        .collect();
    let meta = tensordict_meta(
        DTYPES.iter().zip(&shapes).zip(&keys).map(|((dt, shape), key)| {
            (
                key.as_str(),
                EntryMeta::Leaf {
                    dtype: dt.name,
                    shape: shape.as_slice(),
                    device: "cuda:1",
                },
            )
        }),
        &[5],
    );
    let Some(NodeMeta::TensorDict(td)) = agree(&meta) else {
        panic!()
    };
    let got: Vec<&str> = td.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(got, keys);
    let Some(NodeMeta::NonTensor(v)) = agree(&non_tensor_meta(&serde_json::json!({"b": [1, null]}))) else {
        panic!()
    };
    assert_eq!(v.to_string(), r#"{"b":[1,null]}"#);
}

#[test]
fn a_key_named_data_is_an_ordinary_entry() {
    let td = tensordict(&format!(
        r#"{{"data": {}, "x": {{"type": "TensorDict"}}, "shape": [2], {TD}}}"#,
        leaf("torch.int32", "[2, 2]")
    ));
    assert_eq!(td.entries[0].0, "data");
    assert!(matches!(&td.entries[0].1, Entry::Leaf(l) if l.nbytes == 16));
}

#[test]
fn unusual_files_go_to_the_generic_parser() {
    let l = leaf("torch.float32", "[2]");
    let cases = [
        // a key twice: the generic parser's last-wins applies
        format!(r#"{{"x": {l}, "x": {l}, "shape": [2], {TD}}}"#),
        format!(r#"{{"x": {l}, "shape": [2], "shape": [2], {TD}}}"#),
        // values of odd types the generic parser tolerates
        format!(
            r#"{{"x": {{"dtype": "torch.float32", "shape": [2], "is_nested": null}}, "shape": [2], {TD}}}"#
        ),
        format!(r#"{{"x": {l}, "shape": [2], "_class": 7, "_type": "<class 'tensordict._td.TensorDict'>"}}"#),
        format!(r#"{{"x": {{"type": 1, "dtype": 5}}, "shape": [2], {TD}}}"#),
        // metadata of NonTensorData that is not null
        r#"{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": 1, "other": 5}"#.to_string(),
    ];
    for case in &cases {
        assert!(parse(case.as_bytes()).is_none(), "{case}");
        assert!(parse_meta(case.as_bytes(), path()).is_ok(), "{case}");
        agree(case.as_bytes());
    }
}

#[test]
fn damaged_files_raise_the_generic_error_naming_the_file() {
    let l = leaf("torch.float32", "[2]");
    let cases = [
        ("{not json".to_string(), "not valid JSON"),
        (
            format!(r#"{{"x": {l}, "shape": [2], {TD}}} trailing"#),
            "not valid JSON",
        ),
        ("[1]".to_string(), "not a JSON object"),
        (r#"{"x": 1}"#.to_string(), "no _type"),
        (format!(r#"{{{TD}, "_format_version": 2}}"#), "_format_version"),
        (
            format!(r#"{{"x": {}, "shape": [2], {TD}}}"#, leaf("torch.foo", "[2]")),
            "unknown dtype",
        ),
        (
            format!(
                r#"{{"x": {}, "shape": [2], {TD}}}"#,
                leaf("torch.int8", "[2, -1]")
            ),
            "non-negative",
        ),
        (
            format!(
                r#"{{"x": {}, "shape": [2], {TD}}}"#,
                leaf("torch.int8", "[2, 1.0]")
            ),
            "non-negative",
        ),
        (
            format!(
                r#"{{"x": {}, "shape": [2], {TD}}}"#,
                leaf("torch.int8", "[9223372036854775808]")
            ),
            "non-negative",
        ),
        (
            format!(
                r#"{{"x": {}, "shape": [2], {TD}}}"#,
                leaf("torch.int8", "[2, 4294967296, 4294967296]")
            ),
            "overflows",
        ),
        (
            format!(r#"{{"x": {}, "shape": [2], {TD}}}"#, leaf("torch.int8", "[3]")),
            "batch size",
        ),
        // `-0` is 0 to Python, but the generic parser refuses a signed dimension: so does this path
        (
            format!(
                r#"{{"x": {}, "shape": [2], {TD}}}"#,
                leaf("torch.int8", "[2, -0]")
            ),
            "non-negative",
        ),
        (format!(r#"{{"shape": [-0], {TD}}}"#), "non-negative"),
        (
            r#"{"shape": [], "_type": "<class 'tensordict._td.TensorDict'>", "_format_version": -0}"#
                .to_string(),
            "_format_version",
        ),
        (
            format!(r#"{{"x": {{"dtype": "torch.int8"}}, "shape": [2], {TD}}}"#),
            "shape is missing",
        ),
        (
            format!(r#"{{"x": {{"shape": [2]}}, "shape": [2], {TD}}}"#),
            "dtype is missing",
        ),
        (format!(r#"{{"x": 7, "shape": [2], {TD}}}"#), "not an object"),
        (format!(r#"{{"data": 7, "shape": [2], {TD}}}"#), "not an object"),
        (
            format!(
                r#"{{"x": {{"dtype": "torch.int8", "shape": [2], "is_nested": true}}, "shape": [2], {TD}}}"#
            ),
            "nested",
        ),
        (
            format!(r#"{{"shape": [2], "device": "gpu", {TD}}}"#),
            "not a device",
        ),
        (format!(r#"{{"shape": [2], "device": 3, {TD}}}"#), "not a string"),
        (format!(r#"{{"shape": "2", {TD}}}"#), "not a list"),
        (
            r#"{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "_is_non_tensor": true}"#
                .to_string(),
            "pickle",
        ),
        (
            r#"{"_class": "tensordict:LazyStackedTensorDict"}"#.to_string(),
            "not supported",
        ),
    ];
    for (case, expect) in &cases {
        assert!(parse(case.as_bytes()).is_none(), "{case}");
        let err = parse_meta(case.as_bytes(), path()).unwrap_err().to_string();
        assert!(
            err.contains(expect) && err.contains("/d/meta.json"),
            "{case}: {err}"
        );
        agree(case.as_bytes());
    }
}

#[test]
fn mutated_files_never_load_as_other_data() {
    // Every one-byte change, deletion and truncation of a valid file: whatever the fast path
    // accepts is exactly what the generic parser makes of the same bytes.
    let meta = format!(
        r#"{{"a": {}, "data": {}, "b": {{"type": "TensorDict"}}, "shape": [3], "device": "cpu", {TD}}}"#,
        leaf("torch.int16", "[3, 2]"),
        leaf("torch.float64", "[3]")
    );
    let bytes = meta.as_bytes();
    let mut accepted = 0;
    for i in 0..bytes.len() {
        for b in [b'0', b'9', b'"', b',', b'}', b'[', b'-', b'x', b' '] {
            let mut m = bytes.to_vec();
            m[i] = b;
            accepted += agree(&m).is_some() as usize;
        }
        let mut m = bytes.to_vec();
        m.remove(i);
        accepted += agree(&m).is_some() as usize;
        accepted += agree(&bytes[..i]).is_some() as usize;
    }
    assert!(accepted > 0);
}
