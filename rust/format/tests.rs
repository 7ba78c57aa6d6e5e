use std::path::Path;

use super::*;

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
fn a_user_class_is_a_tensorclass_directory() {
    let meta = br#"{"_type": "<class '__main__.Sample'>", "source": "x"}"#;
    assert!(
        fast::parse(meta).is_none(),
        "the fast parser leaves it to the generic one"
    );
    let NodeMeta::TensorClass(map) = parse_meta(meta, Path::new("p")).unwrap() else {
        panic!()
    };
    assert_eq!(map["source"], "x");
    // tensordict's own classes are not user classes
    let ntd = br#"{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": 1}"#;
    assert!(matches!(
        parse_meta(ntd, Path::new("p")).unwrap(),
        NodeMeta::NonTensor(_)
    ));
    let entry = tensordict_meta([("inner", EntryMeta::TensorClass("Inner"))], &[]);
    assert!(String::from_utf8(entry)
        .unwrap()
        .starts_with(r#"{"inner": {"type": "Inner"}, "shape""#));
}
