use super::*;

#[test]
fn file_map_shares_writes() {
    let dir = std::env::temp_dir().join(format!("tdrs-test-{}", random_suffix()));
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("x.bin");
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    fill_file(&file, Some(&[1, 2, 3, 4]), 4).unwrap();
    let r = map_file(&file, 4, Some(path.clone()), MapMode::Shared).unwrap();
    drop(file);
    // SAFETY: r spans 4 writable bytes.
    unsafe { *r.as_ptr() = 9 };
    r.flush().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), vec![9, 2, 3, 4]);
    drop(r); // Windows refuses to delete a mapped file.
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn arena_offset_is_inside_anonymous_memory_only() {
    let region = crate::sys::anon::anonymous(None, 256).unwrap();
    let start = region.as_ptr() as usize;
    assert_eq!(region.arena_offset(start + 64, 192), Some(64));
    assert_eq!(region.arena_offset(start, 256), Some(0));
    assert_eq!(region.arena_offset(start + 64, 193), None, "past the end");
    assert_eq!(
        region.arena_offset(start.wrapping_sub(1), 2),
        None,
        "before the start"
    );
    assert_eq!(region.arena_offset(start, 0), None, "empty");
    assert_eq!(region.arena_offset(usize::MAX, 2), None, "overflow");
    let path = std::env::temp_dir().join(format!("tdrs-test-{}", random_suffix()));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    fill_file(&file, Some(&[1, 2, 3, 4]), 4).unwrap();
    let mapped = map_file(&file, 4, Some(path.clone()), MapMode::Shared).unwrap();
    assert_eq!(mapped.arena_offset(mapped.as_ptr() as usize, 4), None, "a file");
    drop((mapped, file));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn reserve_sets_length() {
    let path = std::env::temp_dir().join(format!("tdrs-test-{}", random_suffix()));
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    reserve(&file, 12345).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 12345);
    std::fs::remove_file(&path).unwrap();
}
