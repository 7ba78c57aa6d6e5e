use super::*;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tdrs-st-{}-{name}", storage::random_suffix()))
}

#[test]
fn round_trips_and_validates() {
    let path = tmp("a.safetensors");
    let a: Vec<u8> = (0..24).collect();
    let b = [1u8, 0, 1];
    let tensors = vec![
        WriteTensor {
            name: "x.y".into(),
            dtype: "torch.float32".into(),
            shape: vec![2, 3],
            data: &a,
        },
        WriteTensor {
            name: "flag".into(),
            dtype: "torch.bool".into(),
            shape: vec![3],
            data: &b,
        },
        WriteTensor {
            name: "none".into(),
            dtype: "torch.int64".into(),
            shape: vec![0, 4],
            data: &[],
        },
    ];
    let meta = HashMap::from([("k".to_string(), "v".to_string())]);
    write(&path, &tensors, meta).unwrap();
    let file = read(&path).unwrap();
    assert_eq!(file.metadata.get("k").map(String::as_str), Some("v"));
    let map = file.map.to_vec();
    let by_name: HashMap<_, _> = file.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let x = by_name["x.y"];
    assert_eq!((x.dtype, x.shape.as_slice()), ("torch.float32", &[2u64, 3][..]));
    let Some(TensorBytes::InFile { offset, len }) = x.data else {
        panic!("x.y should be in the file")
    };
    assert_eq!(&map[offset..offset + len], &a[..]);
    assert!(by_name["none"].data.is_none());
    drop(file); // Windows refuses to overwrite a mapped file.

    // damaged files are refused with the path in the message
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let err = read(&path).err().unwrap().to_string();
    assert!(
        err.contains("not a valid safetensors file") && err.contains("a.safetensors"),
        "{err}"
    );
    std::fs::write(&path, [255u8; 16]).unwrap();
    assert!(read(&path).is_err());
    std::fs::write(&path, b"abc").unwrap();
    assert!(read(&path).is_err());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn refuses_unstorable_dtypes_and_wrong_sizes() {
    let path = tmp("b.safetensors");
    let data = [0u8; 16];
    let bad = |dtype: &str, shape: Vec<usize>| {
        let t = [WriteTensor {
            name: "k".into(),
            dtype: dtype.into(),
            shape,
            data: &data,
        }];
        write(&path, &t, HashMap::new()).err().unwrap().to_string()
    };
    assert!(bad("torch.complex128", vec![1]).contains("cannot be stored"));
    assert!(bad("torch.float32", vec![3]).contains("bytes given"));
    assert!(!path.exists());
}
