use serde_json::json;

use super::*;
use crate::format::DTYPES;

fn leaf(key: &str, dtype: &'static str, shape: &[u64], nbytes: usize) -> (String, SummaryEntry) {
    let shape = shape.to_vec();
    (key.to_string(), SummaryEntry::Leaf { dtype, shape, nbytes })
}

fn value(key: &str, v: Value) -> (String, SummaryEntry) {
    (key.to_string(), SummaryEntry::NonTensor(v))
}

fn node(
    batch: &[u64],
    device: Option<&str>,
    version: Option<u64>,
    entries: Vec<(String, SummaryEntry)>,
) -> SummaryNode {
    SummaryNode {
        batch: batch.to_vec(),
        device: device.map(str::to_string),
        format_version: version,
        entries,
    }
}

/// A tree whose repr does not fit on one line, with every kind of entry.
fn wide() -> SummaryNode {
    let next = node(
        &[4, 2],
        None,
        Some(1),
        vec![
            leaf("reward", "torch.float64", &[4, 2], 64),
            leaf("\u{e9}", "torch.bool", &[4, 2, 1], 8),
        ],
    );
    let label: Value = "a string longer than forty characters in all, really".into();
    let n: Value = serde_json::from_str("3.5").unwrap();
    let k: Value = serde_json::from_str(r#"{"z": [1, null], "a": true}"#).unwrap();
    node(
        &[4],
        Some("cpu"),
        Some(1),
        vec![
            leaf("obs", "torch.float32", &[4, 3, 84], 4032),
            ("next".into(), SummaryEntry::Node(next)),
            value("label", label),
            value("n", n),
            value("k", k),
            leaf("big", "torch.uint8", &[4, 1000], 4000),
            leaf("long_key_name_number_one", "torch.int64", &[4, 10], 320),
            leaf("long_key_name_number_two", "torch.complex64", &[4, 7], 224),
            (
                "void".into(),
                SummaryEntry::Node(node(&[4], Some("cpu"), None, vec![])),
            ),
        ],
    )
}

fn small() -> SummaryNode {
    node(&[], None, None, vec![leaf("a", "torch.bfloat16", &[3], 6)])
}

// The expected reports are what the Python renderer this replaces (`cli/info.py`'s
// `format_text` and `format_json` over the same tree) printed.
const WIDE_TEXT: &str = "td\nTensorDict(batch_size=[4], device=cpu, fields={\n    big: u8[1000],\n    k: dict,\n    label: str,\n    long_key_name_number_one: i64[10],\n    long_key_name_number_two: c64[7],\n    n: float,\n    next: [2]{reward: f64[], é: bool[1]},\n    obs: f32[3,84],\n    void: {}})\nformat version 1; 6 tensors, 2 sub-trees; 8.4 KiB (8,648 bytes)\n\n  3.9 KiB  float32     [4, 3, 84]  obs\n     72 B  tensordict  [4, 2]      next/  (2 leaves)\n     64 B  float64     [4, 2]      next/reward\n      8 B  bool        [4, 2, 1]   next/é\n        -  str                     label = \"a string longer than forty character...\n        -  float                   n = 3.5\n        -  dict                    k = {\"z\": [1, null], \"a\": true}\n  3.9 KiB  uint8       [4, 1000]   big\n    320 B  int64       [4, 10]     long_key_name_number_one\n    224 B  complex64   [4, 7]      long_key_name_number_two\n      0 B  tensordict  [4]         void/  (0 leaves)";
const WIDE_JSON: &str = "{\"path\": \"/data/td\", \"repr\": \"TensorDict(batch_size=[4], device=cpu, fields={\\n    big: u8[1000],\\n    k: dict,\\n    label: str,\\n    long_key_name_number_one: i64[10],\\n    long_key_name_number_two: c64[7],\\n    n: float,\\n    next: [2]{reward: f64[], é: bool[1]},\\n    obs: f32[3,84],\\n    void: {}})\", \"format_version\": 1, \"nbytes\": 8648, \"leaves\": 6, \"sub_trees\": 2, \"tree\": {\"kind\": \"tensordict\", \"batch_size\": [4], \"device\": \"cpu\", \"format_version\": 1, \"nbytes\": 8648, \"leaves\": 6, \"sub_trees\": 2, \"entries\": {\"obs\": {\"kind\": \"tensor\", \"dtype\": \"torch.float32\", \"shape\": [4, 3, 84], \"nbytes\": 4032}, \"next\": {\"kind\": \"tensordict\", \"batch_size\": [4, 2], \"device\": null, \"format_version\": 1, \"nbytes\": 72, \"leaves\": 2, \"sub_trees\": 0, \"entries\": {\"reward\": {\"kind\": \"tensor\", \"dtype\": \"torch.float64\", \"shape\": [4, 2], \"nbytes\": 64}, \"é\": {\"kind\": \"tensor\", \"dtype\": \"torch.bool\", \"shape\": [4, 2, 1], \"nbytes\": 8}}}, \"label\": {\"kind\": \"non_tensor\", \"value\": \"a string longer than forty characters in all, really\"}, \"n\": {\"kind\": \"non_tensor\", \"value\": 3.5}, \"k\": {\"kind\": \"non_tensor\", \"value\": {\"z\": [1, null], \"a\": true}}, \"big\": {\"kind\": \"tensor\", \"dtype\": \"torch.uint8\", \"shape\": [4, 1000], \"nbytes\": 4000}, \"long_key_name_number_one\": {\"kind\": \"tensor\", \"dtype\": \"torch.int64\", \"shape\": [4, 10], \"nbytes\": 320}, \"long_key_name_number_two\": {\"kind\": \"tensor\", \"dtype\": \"torch.complex64\", \"shape\": [4, 7], \"nbytes\": 224}, \"void\": {\"kind\": \"tensordict\", \"batch_size\": [4], \"device\": \"cpu\", \"format_version\": null, \"nbytes\": 0, \"leaves\": 0, \"sub_trees\": 0, \"entries\": {}}}}}";
const SMALL_TEXT: &str = "x\nTensorDict(batch_size=[], fields={a: bf16[3]})\nformat version (none recorded); 1 tensors, 0 sub-trees; 6 B (6 bytes)\n\n  6 B  bfloat16  [3]  a";
const SMALL_JSON: &str = "{\"path\": \"/x\", \"repr\": \"TensorDict(batch_size=[], fields={a: bf16[3]})\", \"format_version\": null, \"nbytes\": 6, \"leaves\": 1, \"sub_trees\": 0, \"tree\": {\"kind\": \"tensordict\", \"batch_size\": [], \"device\": null, \"format_version\": null, \"nbytes\": 6, \"leaves\": 1, \"sub_trees\": 0, \"entries\": {\"a\": {\"kind\": \"tensor\", \"dtype\": \"torch.bfloat16\", \"shape\": [3], \"nbytes\": 6}}}}";

#[test]
fn renders_as_the_python_renderer_did() {
    assert_eq!(text_report("td", &wide()), WIDE_TEXT);
    assert_eq!(json_report("/data/td", &wide()), WIDE_JSON);
    assert_eq!(text_report("x", &small()), SMALL_TEXT);
    assert_eq!(json_report("/x", &small()), SMALL_JSON);
}

#[test]
fn json_report_is_json_with_the_totals() {
    let v: Value = serde_json::from_str(&json_report("/data/td", &wide())).unwrap();
    assert_eq!(
        (
            v["nbytes"].as_u64(),
            v["leaves"].as_u64(),
            v["sub_trees"].as_u64()
        ),
        (Some(8648), Some(6), Some(2))
    );
    assert_eq!(
        v["tree"]["entries"]["next"]["entries"]["\u{e9}"]["shape"],
        json!([4, 2, 1])
    );
    assert_eq!(
        v["tree"]["entries"]["k"]["value"],
        json!({"z": [1, null], "a": true})
    );
    // Entries in file order, not sorted.
    let keys: Vec<&String> = v["tree"]["entries"].as_object().unwrap().keys().collect();
    assert_eq!(keys[..3], ["obs", "next", "label"]);
}

#[test]
fn repr_fits_one_line_when_it_can() {
    let td = node(
        &[4],
        Some("cpu"),
        Some(1),
        vec![
            leaf("a", "torch.float32", &[4, 3], 48),
            (
                "b".into(),
                SummaryEntry::Node(node(
                    &[4],
                    None,
                    Some(1),
                    vec![leaf("c", "torch.float32", &[4], 16)],
                )),
            ),
        ],
    );
    assert_eq!(
        compact_repr(&td),
        "TensorDict(batch_size=[4], device=cpu, fields={a: f32[3], b: {c: f32[]}})"
    );
    // Sorted by the flat text `key: value` (so `a: ...` before `a_b: ...` before `b: ...`).
    let td = node(
        &[],
        None,
        None,
        vec![
            leaf("b", "torch.int8", &[], 1),
            leaf("a_b", "torch.int8", &[], 1),
            leaf("a", "torch.int8", &[2], 2),
        ],
    );
    assert_eq!(
        compact_repr(&td),
        "TensorDict(batch_size=[], fields={a: i8[2], a_b: i8[], b: i8[]})"
    );
}

#[test]
fn deep_trees_break_where_they_do_not_fit() {
    // 70 columns of keys at the third level: the inner trees go one entry per line.
    let inner = |k: &str| {
        node(
            &[],
            None,
            None,
            vec![
                leaf(&format!("{k}_first_key_that_is_long"), "torch.float32", &[10], 40),
                leaf(
                    &format!("{k}_second_key_that_is_long"),
                    "torch.float32",
                    &[10],
                    40,
                ),
            ],
        )
    };
    let mid = node(
        &[],
        None,
        None,
        vec![
            ("x".into(), SummaryEntry::Node(inner("x"))),
            ("y".into(), SummaryEntry::Node(node(&[], None, None, vec![]))),
        ],
    );
    let root = node(&[], None, None, vec![("m".into(), SummaryEntry::Node(mid))]);
    assert_eq!(
        compact_repr(&root),
        "TensorDict(batch_size=[], fields={\n    m: {\n        x: {\n            x_first_key_that_is_long: f32[10],\n            \
         x_second_key_that_is_long: f32[10]},\n        y: {}}})"
    );
}

#[test]
fn short_names_follow_the_python_rule() {
    for dt in DTYPES {
        assert_eq!(short_name(dt.name), short_name_of(dt.name), "{}", dt.name);
    }
    assert_eq!(short_name("torch.float8_e4m3fn"), "f8_e4m3fn");
}

#[test]
fn sizes_and_types_as_python_writes_them() {
    let cases = [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1280, "1.2 KiB"),
        (1536, "1.5 KiB"),
        (3 << 30, "3.0 GiB"),
    ];
    for (n, text) in cases {
        assert_eq!(human_bytes(n), text);
    }
    assert_eq!(human_bytes(1 << 70), "1048576.0 PiB");
    assert_eq!(
        (grouped(0), grouped(999), grouped(1000), grouped(1234567)),
        ("0".into(), "999".into(), "1,000".into(), "1,234,567".into())
    );
    let types: Vec<&str> = [
        "null", "true", "1", "-0", "1.0", "1e5", "2E-3", "\"s\"", "[]", "{}",
    ]
    .iter()
    .map(|t| python_type(&serde_json::from_str(t).unwrap()))
    .collect();
    assert_eq!(
        types,
        ["NoneType", "bool", "int", "int", "float", "float", "float", "str", "list", "dict"]
    );
}
