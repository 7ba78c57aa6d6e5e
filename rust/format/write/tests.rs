use serde_json::{Map, Value};

use super::*;

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
