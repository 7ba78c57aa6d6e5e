use std::sync::atomic::Ordering;

use super::*;

#[test]
fn counted_writes_advance_in_pieces() {
    let counter = Arc::new(AtomicU64::new(0));
    let path = std::env::temp_dir().join(format!("tdrs-progress-{}", crate::sys::storage::random_suffix()));
    let file = std::fs::File::create(&path).unwrap();
    let data = vec![7u8; PROGRESS_CHUNK * 2 + 5];
    let seen = counting(Some(counter.clone()), || {
        crate::sys::storage::write_all_at(&file, &data, 3).unwrap();
        counter.load(Ordering::Relaxed)
    });
    assert_eq!(seen, data.len() as u64);
    assert_eq!(std::fs::read(&path).unwrap()[3..], data[..]);
    std::fs::remove_file(&path).unwrap();
}
