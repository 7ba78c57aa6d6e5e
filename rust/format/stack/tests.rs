use super::*;

fn strings(v: &[&str]) -> Cells {
    let mut bytes = Vec::new();
    let mut offsets = vec![0];
    for s in v {
        bytes.extend_from_slice(s.as_bytes());
        offsets.push(bytes.len() as i64);
    }
    Cells::Strings { bytes, offsets }
}

#[test]
fn strings_1d_and_2d() {
    assert_eq!(
        read(r#"["a","bb","é"]"#, None).unwrap(),
        StackData {
            shape: vec![3],
            cells: strings(&["a", "bb", "é"])
        }
    );
    assert_eq!(
        read(r#"[["a","b"],["c","d"],["e","f"]]"#, None).unwrap(),
        StackData {
            shape: vec![3, 2],
            cells: strings(&["a", "b", "c", "d", "e", "f"])
        }
    );
    assert_eq!(read(r#"["a\n\"b"]"#, None).unwrap().cells, strings(&["a\n\"b"]));
}

#[test]
fn ragged_and_mixed_go_generic() {
    let ragged = read(r#"[["a","b"],["c"]]"#, None).unwrap();
    assert_eq!(ragged.shape, vec![2]);
    assert!(matches!(ragged.cells, Cells::Json(ref v) if v.len() == 2));
    let mixed = read(r#"["a",1,null]"#, None).unwrap();
    assert_eq!(mixed.shape, vec![3]);
    let cell_lists = read(r#"[[1,2],[3,4]]"#, None).unwrap();
    assert_eq!(cell_lists.shape, vec![2, 2]);
    let with_shape = read(r#"[[1,2],[3,4]]"#, Some(&[2])).unwrap();
    assert_eq!(with_shape.shape, vec![2]);
    let strings_shape = read(r#"[["a","b"],["c","d"]]"#, Some(&[2])).unwrap();
    assert_eq!(strings_shape.shape, vec![2]);
    assert!(matches!(strings_shape.cells, Cells::Json(_)));
    assert_eq!(read("[]", None).unwrap().shape, vec![0]);
    assert_eq!(read("[[],[]]", None).unwrap().shape, vec![2, 0]);
}

#[test]
fn refusals() {
    assert_eq!(read("5", None), Err(DataError::NotAList));
    assert_eq!(read(r#""a""#, None), Err(DataError::NotAList));
    assert!(matches!(
        read("[1,2]", Some(&[3])),
        Err(DataError::ShapeMismatch { .. })
    ));
    assert!(matches!(read("[1,", None), Err(DataError::Json(_))));
}

#[test]
fn write_round_trips() {
    for text in [
        r#"["a","bb","\u00e9"]"#,
        r#"[["a","b"],["c","d"]]"#,
        r#"["a",1,null,{"k":[1,2]},[true,2.5]]"#,
        r#"[["a","b"],["c"]]"#,
    ] {
        let data = read(text, None).unwrap();
        let mut out = Vec::new();
        write(&data.shape, &data.cells, &mut out);
        let again = read(std::str::from_utf8(&out).unwrap(), None).unwrap();
        assert_eq!(again, data, "{text}");
    }
    let mut out = Vec::new();
    write(&[2], &strings(&["a\"", "é"]), &mut out);
    assert_eq!(out, "[\"a\\\"\",\"é\"]".as_bytes());
}

#[test]
fn stack_dim_is_checked_and_made_non_negative() {
    let meta = |dim: &str, data: &str| {
        let text = format!(
            r#"{{"_class":"tensordict:NonTensorStack","stack_dim":{dim},"device":null,"data":{data}}}"#
        );
        parse_stack(text.as_bytes(), Path::new("k"))
    };
    assert_eq!(meta("1", r#"[["a","b"],["c","d"]]"#).unwrap().stack_dim, 1);
    assert_eq!(meta("-1", r#"[["a","b"],["c","d"]]"#).unwrap().stack_dim, 1);
    assert_eq!(meta("-1", r#"["a",1]"#).unwrap().stack_dim, 0);
    for (dim, data) in [
        ("2", r#"[["a","b"],["c","d"]]"#),
        ("-3", r#"["a","b"]"#),
        ("1", r#"["a",1]"#),
    ] {
        let err = meta(dim, data).unwrap_err().to_string();
        assert!(err.contains("stack_dim") && err.contains("out of range"), "{err}");
    }
}

/// A stack with an empty dim before its last: the nesting of its data (`[]`, `[[],[]]`) stops
/// at the empty dim, so the shape is written, and read back whole.
#[test]
fn empty_dims_before_the_last_write_the_shape() {
    let none = Cells::Json(Vec::new());
    assert!(needs_shape(&[0, 3], &none));
    assert!(needs_shape(&[2, 0, 3], &none));
    assert!(needs_shape(&[0, 0], &strings(&[])));
    assert!(!needs_shape(&[0], &none));
    assert!(!needs_shape(&[2, 0], &none));
    assert!(!needs_shape(&[3], &strings(&["a", "b", "c"])));
    for shape in [&[0u64, 3][..], &[2, 0, 3]] {
        let mut data = Vec::new();
        write(shape, &none, &mut data);
        let meta = meta_bytes(0, None, &data, needs_shape(shape, &none).then_some(shape));
        let read = parse_stack(&meta, Path::new("k")).unwrap();
        assert_eq!(read.data.shape, shape);
        assert!(read.data.cells.is_empty());
    }
}

/// A file without `"shape"` for such a stack (tensordict's writing, or ours before): the
/// stack takes the dims its tree's batch size has past its empty dim.
#[test]
fn a_stack_without_cells_fits_its_batch_size() {
    let fit = |text: &str, batch: &[u64]| {
        let mut data = read(text, None).unwrap();
        data.fit_batch(batch);
        data.shape
    };
    assert_eq!(fit("[]", &[0, 3]), vec![0, 3]);
    assert_eq!(fit("[[],[]]", &[2, 0, 3]), vec![2, 0, 3]);
    assert_eq!(fit("[]", &[0]), vec![0]);
    assert_eq!(fit("[]", &[]), vec![0]);
    // only where the batch size starts with the dims read, and only without cells
    assert_eq!(fit("[[],[]]", &[3, 0, 1]), vec![2, 0]);
    assert_eq!(fit(r#"["a"]"#, &[1, 2]), vec![1]);
}
