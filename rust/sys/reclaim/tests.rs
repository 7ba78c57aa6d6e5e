use super::*;

fn tmp() -> (std::path::PathBuf, Dir) {
    let p = std::env::temp_dir().join(format!("tdrs-reclaim-{}", crate::sys::storage::random_suffix()));
    std::fs::create_dir(&p).unwrap();
    let dir = Dir::open(&p).unwrap();
    (p, dir)
}

/// A big file's name goes at once while the file itself stays alive (held) until the batch
/// is released; then the background frees it and `wait` returns. Small files are not held.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn big_files_lose_their_name_now_and_their_space_later() {
    let (p, dir) = tmp();
    let big = std::fs::File::create(p.join("big")).unwrap();
    big.set_len(HOLD_BYTES).unwrap();
    drop(big);
    std::fs::write(p.join("small"), b"x").unwrap();
    let mut later = Later::new();
    later.remove_file(&dir, "big", HOLD_BYTES).unwrap();
    later.remove_file(&dir, "small", 1).unwrap();
    assert!(dir.entry_names().unwrap().is_empty());
    assert_eq!(later.held.len(), 1);
    let st = rustix::fs::fstat(&later.held[0]).unwrap();
    assert_eq!(st.st_nlink, 0); // unlinked, alive only through the handle
    assert_eq!(st.st_size as u64, HOLD_BYTES);
    later.release();
    wait();
    assert_eq!(pending(), 0);
    drop(dir);
    std::fs::remove_dir(&p).unwrap();
}

/// `keep` before a rename over the file: the rename does not free it, the release does.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn a_file_renamed_over_is_held() {
    let (p, dir) = tmp();
    let old = std::fs::File::create(p.join("x")).unwrap();
    old.set_len(HOLD_BYTES + 1).unwrap();
    drop(old);
    std::fs::write(p.join("new"), b"new").unwrap();
    let mut later = Later::new();
    later.keep(&dir, "x", HOLD_BYTES + 1);
    dir.rename("new", &dir, "x", false).unwrap();
    let st = rustix::fs::fstat(&later.held[0]).unwrap();
    assert_eq!((st.st_nlink, st.st_size as u64), (0, HOLD_BYTES + 1));
    drop(later); // dropping releases too
    wait();
    assert_eq!(std::fs::read(p.join("x")).unwrap(), b"new");
    drop(dir);
    std::fs::remove_dir_all(&p).unwrap();
}

#[test]
fn make_room_returns_with_nothing_pending() {
    let (p, dir) = tmp();
    make_room(&dir, u64::MAX);
    drop(dir);
    std::fs::remove_dir(&p).unwrap();
}
