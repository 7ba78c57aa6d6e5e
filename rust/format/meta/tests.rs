use super::*;

#[test]
fn nbytes_checks_overflow() {
    assert_eq!(nbytes(&[], 4), Some(4));
    assert_eq!(nbytes(&[0, 5], 4), Some(0));
    assert_eq!(nbytes(&[u64::MAX, 2], 1), None);
    assert_eq!(nbytes(&[1 << 62], 4), None);
}

#[test]
fn value_headers_as_both_libraries_write_them() {
    let ntd = format!("{{\"_type\": \"{NTD_TYPE}\", \"data\": \"x\"");
    let stack = format!(
        "{{\"_type\":\"{}\",\"_format_version\":1",
        super::super::stack::STACK_TYPE
    );
    assert!(is_value_header(ntd.as_bytes()));
    assert!(is_value_header(stack.as_bytes()));
    assert!(is_value_header(
        format!(" {{ \"_type\" :\n\"{NTD_TYPE}\"").as_bytes()
    ));
    assert!(NTD_TYPE.len() + 16 < VALUE_HEADER_LEN);
    // a TensorDict's, a truncated one, another first key, a longer type name: not values
    assert!(!is_value_header(format!("{{\"_type\":\"{TD_TYPE}\"").as_bytes()));
    assert!(!is_value_header(format!("{{\"_type\":\"{NTD_TYPE}").as_bytes()));
    assert!(!is_value_header(
        format!("{{\"data\":1,\"_type\":\"{NTD_TYPE}\"").as_bytes()
    ));
    assert!(!is_value_header(
        b"{\"_type\":\"<class 'tensordict.tensorclass.NonTensorDataX'>\""
    ));
    assert!(!is_value_header(b""));
}
