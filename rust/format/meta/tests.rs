use super::*;

#[test]
fn nbytes_checks_overflow() {
    assert_eq!(nbytes(&[], 4), Some(4));
    assert_eq!(nbytes(&[0, 5], 4), Some(0));
    assert_eq!(nbytes(&[u64::MAX, 2], 1), None);
    assert_eq!(nbytes(&[1 << 62], 4), None);
}
